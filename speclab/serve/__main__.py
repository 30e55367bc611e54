"""`python -m speclab.serve [MODEL] [flags]`, the same as `speclab serve`."""

from speclab.serve.cli import serve_main

if __name__ == "__main__":
    serve_main()
