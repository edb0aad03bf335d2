"""Operator facts: what fxloom knows about the operations a graph calls."""
