"""Tests that run npuc artifacts on vendor simulators."""
