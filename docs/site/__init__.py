"""The side-by-side page: the three implementations aligned step by step, and the figures.

``make docs`` (``python -m docs.site``) writes build/docs/index.html from the source files;
``make figures`` (``python -m docs.site.figures``) remakes docs/figures/*.png. What the page
shows is declared in ``sections.py`` (which files and functions), ``idioms.py`` (one sentence
per step) and ``figures.py`` (the figure table); ``steps.py`` reads and checks the steps,
``page.py`` writes the HTML and the README's excerpt, ``browser.py`` opens the page in headless
Chromium.
"""
