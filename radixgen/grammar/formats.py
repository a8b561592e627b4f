"""Our own regexes for JSON-schema `format`s the libraries get wrong, and the schema rewrite using them.

Measured on the JSON-Schema-Test-Suite (optional/format): XGrammar and outlines-core accept
"2020-02-30" as a `date`, all three libraries accept "23:58:60Z" as a `time` and invalid punycode
("xn--X") as a `hostname`. Here each such format is a regex that accepts only valid values
(narrower where the exact language is not worth it): checked against the suite and against
python-jsonschema's format checker, the oracle of the generation tests. Backends compile
`{"format": "date"}` as `{"pattern": "^(?:...)$"}` (`narrow.lower_formats`), so every backend that
enforces `pattern` enforces these formats the same way.

- date: RFC 3339 full-date with the Gregorian leap-year rule; year 0000 excluded (Python's `date`
  has no year 0).
- time / date-time: RFC 3339 with a mandatory offset; second 60 (a leap second, valid only at
  23:59:60 UTC) is excluded altogether: `rfc3339-validator` rejects it everywhere.
- hostname: RFC 1123 letter-digit-hyphen labels, no hyphen at either end, no "--" in positions 3-4
  (that prefix marks punycode, which a regex cannot validate), at most 8 labels of at most 30
  characters (so the whole name stays under the 253-character limit).
- ipv4 / ipv6: RFC 3986's `IPv4address` (no leading zeros) / `IPv6address` (exact).
- email: RFC 5321 dot-atom local part @ hostname or address literal; quoted local parts are left
  out (their `"` and `\\` would need JSON escapes inside the pattern, which not every backend maps).
- uuid: 8-4-4-4-12 hex digits. uri: RFC 3986 `URI` (scheme, optional authority, path, query, fragment).
"""

from __future__ import annotations

_YEAR = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
TIME = "(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]))"
DATE_TIME = f"(?:{DATE}[Tt]{TIME})"
_ALNUM = "[a-zA-Z0-9]"
_LDH = "[a-zA-Z0-9-]"
_LABEL = (f"(?:{_ALNUM}(?:{_ALNUM}|{_LDH}{_ALNUM}|{_LDH}{_LDH}{_ALNUM}"
          f"|{_LDH}(?:{_ALNUM}{_LDH}|-{_ALNUM}){_LDH}{{0,25}}{_ALNUM})?)")
HOSTNAME = f"(?:{_LABEL}(?:\\.{_LABEL}){{0,7}})"
IPV4 = "(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_H16 = "[0-9a-fA-F]{1,4}"
_LS32 = f"(?:{_H16}:{_H16}|{IPV4})"
IPV6 = "(?:" + "|".join([
    f"(?:{_H16}:){{6}}{_LS32}",
    f"::(?:{_H16}:){{5}}{_LS32}",
    f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    f"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
EMAIL = f"(?:{_ATEXT}+(?:\\.{_ATEXT}+)*@(?:{HOSTNAME}|\\[{IPV4}\\]|\\[IPv6:{IPV6}\\]))"
UUID = "(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
_PCT = "%[0-9A-Fa-f]{2}"
_UNRESERVED_SUB = "[A-Za-z0-9._~!$&'()*+,;=-]"
_PCHAR = f"(?:{_UNRESERVED_SUB}|{_PCT}|[:@])"
_AUTHORITY = (f"(?:(?:{_UNRESERVED_SUB}|{_PCT}|:)*@)?(?:\\[{IPV6}\\]|(?:{_UNRESERVED_SUB}|{_PCT})*)"
              "(?::[0-9]*)?")
_PATHS = f"(?://{_AUTHORITY}(?:/{_PCHAR}*)*|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_PCHAR}+(?:/{_PCHAR}*)*)?"
URI = f"(?:[A-Za-z][A-Za-z0-9+.-]*:{_PATHS}(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?)"

# XGrammar 0.2.9 mis-compiles an optional group holding a `*` / `+` inside a JSON-schema `pattern`
# (`^(?:xy[0-9]+)?$` accepts "1"); `{0,1}` is the same language and compiles right everywhere.
FORMAT_REGEX = {name: regex.replace(")?", "){0,1}") for name, regex in {
    "date": DATE, "time": TIME, "date-time": DATE_TIME, "hostname": HOSTNAME, "ipv4": IPV4, "ipv6": IPV6,
    "email": EMAIL, "uuid": UUID, "uri": URI}.items()}
LOWERED_FORMATS = frozenset(FORMAT_REGEX)


def format_pattern(name: str) -> str:
    """The anchored `pattern` that stands for `format: name` (one of `LOWERED_FORMATS`)."""
    return f"^{FORMAT_REGEX[name]}$"
