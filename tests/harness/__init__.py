"""Shared test harness: doubles and helpers used by more than one test module."""
