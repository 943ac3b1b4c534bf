from .cli import dispatch

dispatch()
