"""The in-graph statistics: the fetch built from the native kernel or stock ops (``fast``) and the
exact stock-op statistics it matches and falls back to (``exact``). The C++ kernel is
``hooks.native``.
"""
