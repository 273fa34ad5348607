"""The process ``flows.ephemeral_api`` starts: uvicorn serving Prefect's API app (the arguments are
uvicorn's), with the garbage collector held while it imports the server (``rec.startup_gc``: the
imports and the app's creation take about a quarter less CPU, so the API answers sooner)."""

from __future__ import annotations

from rec import startup_gc


def main() -> None:
    with startup_gc.importing():
        import prefect.server.api.server  # noqa: F401  the app's module, which uvicorn's --factory names
        import uvicorn

    uvicorn.main()  # parses this process's arguments, as `python -m uvicorn` does


if __name__ == "__main__":
    main()
