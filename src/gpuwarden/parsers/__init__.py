"""Pure functions of text: one module per source, tolerant of garbage.

A parser never raises on malformed input: it keeps what it could parse and
reports the rest through the `problems` it returns or skips the line.
"""
