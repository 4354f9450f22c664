"""``python scripts/bench.py [args]`` is ``voicehost bench [args]``; see voicehost/tools/bench.py.

python scripts/bench.py --url http://127.0.0.1:8080 --concurrency 1,4,16 --json bench.json
python scripts/bench.py --start-server --concurrency 1,2 --plot bench.png
"""

import sys

from voicehost.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
