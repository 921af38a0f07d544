"""The project's Jupyter notebooks and the tiny model they (and the page's visualizer) show."""
