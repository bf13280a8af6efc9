"""Runs gcp-storage-emulator with the one response header tensorstore needs (a test helper).

The emulator's media downloads carry no `x-goog-generation` header; tensorstore (Orbax's
arrays and OCDBT manifests) takes an object's generation from it, reads 0 without it, and
then refuses the conditional update of that object ("Malformed StorageGeneration"). This
adds the header from the emulator's own object record, then runs the emulator's CLI:
  python tests/e2e/gcs_emulator.py start --host=127.0.0.1 --port=PORT --in-memory ...
"""

import sys

from gcp_storage_emulator import exceptions
from gcp_storage_emulator.handlers import objects

_download = objects.download


def _download_with_generation(request, response, storage, *args, **kwargs):
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
  except exceptions.NotFound:
    obj = None
  if obj is not None:
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])
  return _download(request, response, storage, *args, **kwargs)


objects.download = _download_with_generation  # Before the server builds its routes.
# pylint: disable=g-import-not-at-top,wrong-import-position
from gcp_storage_emulator import __main__ as emulator  # noqa: E402

if __name__ == "__main__":
  sys.exit(emulator.main())
