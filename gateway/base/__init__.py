"""The base both the gateway and the engine stand on: standard library only, no project import.

Network addresses (`net`), the open-files limit (`oslimits`), a LeaderWorkerSet's environment
(`lws`), the C build helper of the relay and the engine's kernels (`cbuild`), free ports
(`ports`), ready files (`readyfile`), the running loop kept by an object (`loop`), and a
model's chat template rendered as transformers renders it (`chat_template`: jinja2 is imported
when a template is first rendered, by the engine and by a gateway that keys prompts).
`engine/` imports nothing of `gateway/` but this package, and nothing here imports any other
module of the project (tests/architecture holds both).
"""
