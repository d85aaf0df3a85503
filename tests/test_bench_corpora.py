"""bench/corpora.py's readers on small hand-made inputs (no download): R's serialized
character vectors, emails' text parts, wikitext, chapters, and the round-robin build."""

import struct

from bench import corpora


def _xdr_strings(strings):
    blob = b"X\n" + struct.pack(">iii", 3, 0x040201, 0x030500) + struct.pack(">i", 5) + b"UTF-8"
    blob += struct.pack(">ii", 16, len(strings))
    for text in strings:
        if text is None:
            blob += struct.pack(">ii", 9, -1)
        else:
            data = text.encode("utf-8")
            blob += struct.pack(">ii", 0x40009, len(data)) + data
    return blob


def test_r_strings():
    assert corpora._r_strings(_xdr_strings(["EMMA", "", None, "Ça va"])) == [
        "EMMA", "", "", "Ça va"]


def test_email_text_keeps_text_parts_only():
    raw = (b"From: a@b\nContent-Type: multipart/alternative; boundary=XX\n\n--XX\n"
           b"Content-Type: text/plain; charset=bogus-charset\n\nHello there.\n--XX\n"
           b"Content-Type: text/html\n\n<p>Hi <b>you</b> &amp; me</p><script>x()</script>\n"
           b"--XX\nContent-Type: image/png\n\nPNGDATA\n--XX--\n")
    paragraphs = corpora._paragraphs(corpora._email_text(raw))
    assert paragraphs == ["Hello there.", "Hi you & me"]


def test_strip_wikitext():
    text = ("{{Infobox|a={{b}}}} '''Albedo''' is [[reflection|reflectivity]] of a "
            "[[surface]].<ref>cite</ref>\n[[File:x.png|thumb|a [[b]] c]]\n== History ==\nOld.")
    assert corpora._paragraphs(corpora._strip_wikitext(text)) == [
        "Albedo is reflectivity of a surface.", "History", "Old."]


def test_chapters_drop_the_front_matter():
    text = "Title\n\nCHAPTER 1. One.\n\nA.\n\nB.\nCHAPTER 2. Two.\n\nC.\n\nD.\n"
    docs = list(corpora._chapters("book", text, r"\n(?:CHAPTER \d+\.[^\n]*)\n"))
    assert docs == [("book/001", ["A.", "B."]), ("book/002", ["C.", "D."])]
