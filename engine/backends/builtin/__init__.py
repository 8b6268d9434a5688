"""The builtin backend: this project's own tensor-parallel engine (engine.runtime) as a node.

`node.run_node` is what `unitgate node --backend builtin` runs; `bare` is the same node
without the OpenAI server, for tests and smoke runs.
"""
