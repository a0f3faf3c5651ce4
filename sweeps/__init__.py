"""Orchestration on top of the engine: recipes -> trials -> execution -> tracking -> reports."""
