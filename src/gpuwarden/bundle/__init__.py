"""Bundles: capture what the rules read (collect), and reopen a capture as a root (open)."""
