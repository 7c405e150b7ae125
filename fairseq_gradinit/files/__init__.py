"""Safe output and loading, shared by the commands, the lab's study and the plugin's save folder: the one
check of the paths a command writes and its atomic, marked writes (:mod:`.paths`), one writer per output
folder (:mod:`.locks`), and fairseq checkpoints loaded under torch >= 2.6 (:mod:`.checkpoints`)."""
