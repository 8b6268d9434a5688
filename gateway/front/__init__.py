"""The public listener's lean front: the proxy's routes served on a protocol of its own,
everything else handed to aiohttp (server.py)."""
