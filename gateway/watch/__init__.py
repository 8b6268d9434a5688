"""`unitgate watch`: a node's `/health`, answered for a follower process that serves no HTTP.

Stock multi-node vLLM (`vllm serve --headless`) runs followers with no server at all. The
sidecar watches one such process through /proc (in Kubernetes: a second container of the pod,
with `shareProcessNamespace: true`) and answers the node contract on its behalf: 200 with
`status: ok` while the process runs, 503 with `gone`, `zombie` or `stopped` when it does not.

`proc` parses /proc text (pure), `locate` finds and follows the process, `placement` says which
unit and rank it is, `app` serves the answer, `cli` is the command line.
"""
