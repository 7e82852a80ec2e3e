"""Scaling studies: model shapes for target sizes (shapes), the fits (fit) and figures (plots)."""
