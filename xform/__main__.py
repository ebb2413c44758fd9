"""`python -m xform`: the `xform` command."""
from xform.cli import main

if __name__ == "__main__":
    main()
