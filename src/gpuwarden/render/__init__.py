"""Renderers: functions of a Report; they know no rule."""
