# attack: add a markdown cell (and an SVG attachment) holding script, and display HTML and JavaScript from the answer: opened in the instructor's formgrader the script would run in the instructor's Jupyter origin (set its own scores through the formgrader's API, read solutions/ through /api/contents), and in the student's feedback page
# defended-by: files
# markdown: <script>window.DTLABS_PWNED = 1; fetch("/formgrader/api/grades")</script><img src="x" onerror="window.DTLABS_PWNED = 2"><iframe src="javascript:parent.DTLABS_PWNED = 3"></iframe>[click](javascript:window.DTLABS_PWNED=4) ![svg](attachment:pwn.svg) DTLABS-MARKDOWN
from IPython.display import HTML as _HTML, Javascript as _Javascript, display as _display

_display(_HTML('<script>window.DTLABS_PWNED = 5</script><b onmouseover="window.DTLABS_PWNED = 6">DTLABS-HTML</b>'))
_display(_Javascript("window.DTLABS_PWNED = 7"))
