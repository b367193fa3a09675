"""Every relative link of the README and docs/*.md names a file that exists and, with a #fragment, a heading of
that file, as GitHub renders its anchors (lower case; punctuation but '-' and '_' dropped; spaces become '-';
a repeated heading gets -1, -2, ...). Headings and links inside code blocks do not count.
Usage: docs_links_test.py <source dir>"""
import os
import re
import sys

root = sys.argv[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose_lines(path):
    """The lines outside ``` blocks."""
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            yield line.rstrip("\n")


def anchors(path):
    seen, found = {}, set()
    for line in prose_lines(path):
        heading = re.match(r"^#{1,6} (.*)$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


pages = [os.path.join(root, "README.md")] + sorted(
    os.path.join(root, "docs", name) for name in os.listdir(os.path.join(root, "docs")) if name.endswith(".md"))
broken, checked = [], 0
for page in pages:
    for number, line in enumerate(prose_lines(page), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            checked += 1
            file_part, _, fragment = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) if file_part else page
            where = f"{os.path.relpath(page, root)}: ({target})"
            if not os.path.exists(linked):
                broken.append(f"{where}: no file {os.path.relpath(linked, root)}")
            elif fragment and linked.endswith(".md") and fragment not in anchors(linked):
                broken.append(f"{where}: no heading #{fragment} in {os.path.relpath(linked, root)}")
print(f"{checked} relative links in {len(pages)} pages")
for line in broken:
    print("BROKEN", line)
sys.exit(1 if broken else 0)
