"""Dashboard tests: pure figure builders on records, server-side pages, and a real headless Chromium."""
