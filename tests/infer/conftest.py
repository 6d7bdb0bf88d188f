import sys
from pathlib import Path

# the helpers in models.py are imported by plain name from the tests of this folder
sys.path.insert(0, str(Path(__file__).parent))
