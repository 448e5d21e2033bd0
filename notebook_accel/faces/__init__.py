"""What a person uses to start a launch: ``panel.py`` (the ipywidgets LaunchPanel),
``cli.py`` and ``cli_questions.py`` (``notebook-accel launch | config | env``), ``demo.py``
(README's main job)."""
