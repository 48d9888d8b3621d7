"""Provider drivers behind one base class; only the core calls them."""
