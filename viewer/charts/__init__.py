"""The viewer's drawing: Vega-Lite line charts, histograms and percentile bands, the layer x step
heatmap (a raster and the component that draws it) and the op graph (DOT text, colours, the
whole-model view). Pages give them data read through ``viewer.data``."""
