"""The built-in ComfyUI templates, one JSON file each (`templates.builtin_templates` reads them)."""
