"""Scenarios for the soak harness; see ``base.py`` for the contract every scenario meets."""
