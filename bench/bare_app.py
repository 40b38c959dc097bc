"""The bare Streamlit page bench_viewer.py --browser times beside the viewer's pages: a title and
one line of text, nothing else (the same Streamlit, the same flags): Streamlit's own floor.

``?chart=1`` adds one small Vega-Lite chart (a 60-point line, as ``st.line_chart`` draws it):
the floor of a page that draws any chart, since a page's first Vega-Lite chart makes the
browser load and run Vega's code; ``?chart=N`` adds N of them (the Summary draws three).
``?graph=1`` adds one small Graphviz graph (six nodes, as the Op graph's neighbourhood view
draws): the floor of a page that draws a graph (Graphviz's layout runs in the browser)."""
import streamlit as st

st.title("Bare page")
st.write("The floor every viewer page is measured against.")
charts = st.query_params.get("chart", "0")
for k in range(int(charts) if charts.isdigit() else 0):
    st.line_chart({"value": [((i * (37 + k)) % 60) / 60 for i in range(60)]}, x_label="step",
                  y_label="value")
if st.query_params.get("graph") == "1":
    st.graphviz_chart("digraph { rankdir=LR; a -> b -> c; b -> d; d -> e; e -> f }")
