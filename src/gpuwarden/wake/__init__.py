"""Event sources that wake the agent: each bounded, each falling back to the periodic check."""
