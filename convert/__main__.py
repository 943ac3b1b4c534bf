from mlx_speech.cliutil import exit_with

from . import main

exit_with(main())
