"""Figure builders: pure functions from records to Plotly figures, one module per family. No I/O, no Dash, no clock:
tests call them directly.

Figures are theme-free (transparent backgrounds; the stylesheet colours text and grid lines for light and dark), put
times on the x axis as integer milliseconds since the epoch (UTC; half the bytes of ISO strings) and round values to
four significant digits, so the JSON a page receives stays small. ``style`` holds what every family shares.
"""
