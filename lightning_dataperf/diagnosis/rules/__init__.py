"""The rule families the diagnosis runs, one module each."""
