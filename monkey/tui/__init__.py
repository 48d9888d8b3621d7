"""The full-screen Textual dashboard (see the dashboard issue)."""
