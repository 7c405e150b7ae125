"""What the package's entry points share on the command line: argparse types that refuse a bad number
before any work (:mod:`.argtypes`), the engine's options as argparse flags and Markdown lists
(:mod:`.option_forms`), and known third-party noise kept off the console (:mod:`.quiet`)."""
