"""The REST API's JSON parser. A module of its own: DRF reads DEFAULT_PARSER_CLASSES when rest_framework.views
is first imported, so the parser must not live in a module that imports it."""

from rest_framework import exceptions, parsers


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, with JSON nested past what Python's parser recurses into (about 1,000 levels) a 400
    like any other malformed body, not a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply.") from None
