"""Documents the tests translate: three languages, paragraphs of several sentences, lists, odd
whitespace (tabs, trailing spaces, CRLF, runs of blank lines), and in Markdown code blocks, inline
code, links, images, HTML tags and bare URLs. The words are the test Marians' (tests/marian_fixtures.py
CORPUS), so their tokenizer knows them."""

PLAIN = {
    "en": ("the red cat sleeps. a blue dog runs fast! my old bird is here?\n"
           "\n"
           "  one green cat eats bread. the red dog\n"
           "is here.   \n"
           "- a blue bird sleeps\n"
           "- my old cat runs fast. the red bird eats bread\n"
           "\n\n\n"
           "\tone green dog is here.\t\n"),
    "de": ("the red cat sleeps, z.B. a blue dog. Dr. my old bird is here.\r\n"
           "\r\n"
           "1. one green cat eats bread\r\n"
           "2) the red dog is here. a blue cat runs fast\r\n"),
    "fr": ("the red cat sleeps ; a blue dog runs fast. M. my old bird is here !\n"
           "   \n"
           "\u2022 one green cat eats bread\n"
           "the red dog is here\u2026 a blue bird sleeps."),
}

MARKDOWN = """# the red cat sleeps

a blue dog runs fast. my old bird **is here** and `cat --eats bread` too.
see [the red dog](https://example.org/a_(b)?q=1) now.
one green cat eats bread: https://example.org/x.y, then <b>my old cat</b> runs fast.<br>

> the red bird is here.
> a blue cat sleeps.

- my old dog *eats bread*
- one green bird ![the red cat](img/cat.png) runs fast

```python
the red cat sleeps. # code: never translated
print("a blue dog")
```

    indented code: the red dog is here.

| the red cat | a blue dog |
|-------------|------------|
| my old bird | is here    |

<div>an html block: the red cat sleeps.</div>

[ref]: https://example.org/ref "the red title"
"""

# what passes through a Markdown document untouched
UNTOUCHED = ["`cat --eats bread`", "(https://example.org/a_(b)?q=1)", "https://example.org/x.y", "<b>", "</b>",
             "<br>", "![the red cat](img/cat.png)",
             '```python\nthe red cat sleeps. # code: never translated\nprint("a blue dog")\n```',
             "    indented code: the red dog is here.", "<div>an html block: the red cat sleeps.</div>",
             '[ref]: https://example.org/ref "the red title"', "|-------------|------------|"]

HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>the red cat sleeps</title>
<style>p { content: "a blue dog. runs"; }</style></head>
<body>
  <h1>the red cat sleeps</h1>
  <p class="lead">a blue dog <b>runs fast</b>. my old bird is <a href="https://example.org/a?b=1&amp;c=2">here</a>
     &amp; the red dog.<br>one green cat eats bread.</p>
  <!-- a comment: the red cat is here. -->
  <ul><li>my old cat runs fast</li><li>a blue <code>cat --help</code> bird sleeps.</li></ul>
  <pre>the red cat sleeps. never translated</pre>
  <script>const s = "a blue dog. never translated";</script>
  <table><tr><td>my old dog</td><td>is here</td></tr></table>
</body></html>
"""

HTML_UNTOUCHED = ['<!DOCTYPE html>', '<html lang="en">', '<meta charset="utf-8">',
                  '<style>p { content: "a blue dog. runs"; }</style>', '<p class="lead">',
                  '<a href="https://example.org/a?b=1&amp;c=2">', '<br>', '<!-- a comment: the red cat is here. -->',
                  '<code>cat --help</code>', '<pre>the red cat sleeps. never translated</pre>',
                  '<script>const s = "a blue dog. never translated";</script>', '<td>', '</td>', '</body></html>']
