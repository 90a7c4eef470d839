"""Command-line interface: one module per subcommand, gathered by cli.main."""
