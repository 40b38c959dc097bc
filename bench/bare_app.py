"""The bare Streamlit page bench_viewer.py --browser times beside the viewer's pages: a title and
one line of text, nothing else (the same Streamlit, the same flags): Streamlit's own floor."""
import streamlit as st

st.title("Bare page")
st.write("The floor every viewer page is measured against.")
