# ComfyUI imports this file when the repository is cloned into its custom_nodes/
# folder: the node package is comfyui/ (comfyui/__init__.py says what it does).
# Imported any other way (pytest collects the repository's root as a package),
# it does nothing.
if __package__:
    from .comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F401

    WEB_DIRECTORY = "./comfyui/web"
