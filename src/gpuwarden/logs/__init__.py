"""The log engine: find the few lines that matter in big node logs, fast and bounded.

Below the facts: it knows log formats, signatures, byte offsets and time windows, never the
node model. `facts.logs` decides which files of a node are read and builds the `logs` section
with it. Modules: `scan` (the chunked anchor scan and its results), `decode` (one line of a
format -> message and time), `signatures` (the signature table), `scanner` (one source scanned
whole, from an offset, over a time window or incrementally), `window` (seeking a window's start
by time), `cursors` (where each file's scan stopped, across checks), `offsets` (positions in an
open file), `devicemanager` (the kubelet's device-plugin calls read from its scan).
"""
