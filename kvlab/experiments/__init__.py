"""The reproductions as plain functions returning typed results; the CLI and notebooks call these."""
