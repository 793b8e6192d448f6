"""`python -m dsv4_engine_double ...`: run the engine test double (not SGLang; no GPU here)."""

from dsv4_engine_double.server import main

if __name__ == "__main__":
    main()
