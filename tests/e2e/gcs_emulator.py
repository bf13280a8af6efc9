"""Runs gcp-storage-emulator with the one response header tensorstore needs (a test helper).

The emulator's media downloads carry no `x-goog-generation` header; tensorstore (Orbax's
arrays and OCDBT manifests) takes an object's generation from it, reads 0 without it, and
then refuses the conditional update of that object ("Malformed StorageGeneration"). This
adds the header from the emulator's own object record.

It also ignores the `ifGenerationMatch=0` precondition of an upload (create only if absent;
checked: a second such upload overwrites), which `runs/lock.py` relies on; this answers it
as GCS documents: 412 Precondition Failed when the object exists. The emulator's HTTP server
handles one request at a time, so the check and the create are atomic, as on GCS.

And it answers objects.move (`moveTo`), which gcsfs uses for every rename (epath's, so
checkpointing's quarantine of a corrupt step): the emulator has no such route, and gcsfs
retried its 501 with backoff before falling back to a copy and a delete, about 1.8 s per
object (36 s of tests/e2e/test_gcs.py's quarantine of one step; 1.5 s with this).
Then it runs the emulator's CLI:
  python tests/e2e/gcs_emulator.py start --host=127.0.0.1 --port=PORT --in-memory ...
"""

from http import HTTPStatus
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


_insert = objects.insert


def _insert_if_generation_matches(request, response, storage, *args, **kwargs):
  if request.query.get("ifGenerationMatch") == ["0"]:
    name = request.query.get("name", [None])[0]
    if name is None and isinstance(request.data, dict):
      name = request.data.get("meta", {}).get("name")
    try:
      storage.get_file_obj(request.params["bucket_name"], name)
    except exceptions.NotFound:
      pass
    else:
      response.status = HTTPStatus.PRECONDITION_FAILED
      response.json({"error": {"code": 412, "message": "At least one of the pre-conditions "
                               "you specified did not hold.", "errors": [
                                   {"reason": "conditionNotMet"}]}})
      return None
  return _insert(request, response, storage, *args, **kwargs)


def _move(request, response, storage, *args, **kwargs):
  """objects.move within a bucket: a copy and a delete in one request (requests are served
  one at a time, so no other sees the step between)."""
  del args, kwargs
  bucket, source = request.params["bucket_name"], request.params["object_id"]
  try:
    moved = objects._copy(request.base_url, storage, bucket, source, bucket,  # pylint: disable=protected-access
                          request.params["dest_object_id"])
  except exceptions.NotFound:
    response.status = HTTPStatus.NOT_FOUND
    return None
  storage.delete_file(bucket, source)
  return response.json(moved)


objects.download = _download_with_generation  # Before the server builds its routes.
objects.insert = _insert_if_generation_matches
# pylint: disable=g-import-not-at-top,wrong-import-position
from gcp_storage_emulator import __main__ as emulator  # noqa: E402
from gcp_storage_emulator import server  # noqa: E402
from gcp_storage_emulator import settings  # noqa: E402

# Ahead of the object routes, which would take ".../o/SRC/moveTo/o/DST" for an object name.
server.HANDLERS = tuple(
    (rf"^{prefix}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
     r"(?P<dest_object_id>.*[^/]+)$", {server.POST: _move})
    for prefix in (settings.API_ENDPOINT, "")) + server.HANDLERS

if __name__ == "__main__":
  sys.exit(emulator.main())
