"""Durable sessions: workers owned by a supervisor process of ours, outliving the kernel."""
