"""The soak harness: load and fault injection for polyloop. Not part of the library;
``src/polyloop`` never imports it."""
