/* The four zlib calls the engine makes (reading .gz IDX files, checkpoint checksums).
 *
 * zlib's headers come with a development package (Debian: zlib1g-dev) that a machine without root
 * may lack; its library, libz.so.1, is on every Linux that runs CPython. Without the header, these
 * declarations stand in: they are zlib's ABI, unchanged since 1.2 (setup.py then links
 * -l:libz.so.1). */
#ifndef PYDIST_ZLIB_CALLS_H
#define PYDIST_ZLIB_CALLS_H

#if __has_include(<zlib.h>)
#include <zlib.h>
#else
typedef struct gzFile_s *gzFile;
typedef unsigned char Bytef;
typedef unsigned int uInt;
typedef unsigned long uLong;
gzFile gzopen(const char *path, const char *mode);
int gzread(gzFile file, void *buf, unsigned len);
int gzclose(gzFile file);
uLong crc32(uLong crc, const Bytef *buf, uInt len);
#endif

#endif
