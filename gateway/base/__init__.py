"""The base both the gateway and the engine stand on: standard library only, no project import.

Network addresses (`net`), the open-files limit (`oslimits`), a LeaderWorkerSet's environment
(`lws`), the C build helper of the relay and the engine's kernels (`cbuild`), free ports
(`ports`) and ready files (`readyfile`). `engine/` imports nothing of `gateway/` but this
package, and nothing here imports any other module of the project (tests/architecture holds
both).
"""
