"""Hardware profiles (TOML) shipped with rpegc."""
