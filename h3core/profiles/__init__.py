"""The capacity profiles shipped with h3core, one TOML file each (`h3core.adapters.profiles` reads them)."""
