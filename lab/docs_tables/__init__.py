"""The renderers of the docs' generated tables, one module per record they read; ``lab.render_docs`` registers
them and writes them into the pages."""
