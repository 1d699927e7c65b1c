"""Files the kit reads and writes on an operator's machine, each through one door.

- :mod:`.read`: regular files only, a size cap per kind of file checked before reading, never blocking on a
  FIFO or reading a device;
- :mod:`.jsondoc`: JSON read through that door and parsed within bounds (keys given twice, nesting, numbers
  too long to convert);
- :mod:`.npy`: ``.npy`` arrays whose header is checked against the file's size before anything is allocated;
- :mod:`.write`: files written inside an output directory by temporary file and rename, never through a
  symbolic link planted in it.
"""
