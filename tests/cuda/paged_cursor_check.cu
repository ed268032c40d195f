// Host-side check of lab::paged::PageCursor (kernels/common/paged.cuh), no GPU needed: the kernel's loader
// pattern (start, fetch one tile ahead, one offset per 16-key group, each thread's row added in its group,
// advance) against plain division, for every thread's row pattern of decode v03 (D 128: 8 rows 8 apart; D 64:
// 4 rows 16 apart), page sizes 16..256, splits that start inside a page, and tables with bad ids. Each sequence's table is its own heap array of exactly the
// slots its length needs, so a read past them is an AddressSanitizer error (tests/test_paged_cursor.py
// builds this with -fsanitize=address). Prints "ok <cases>" and exits 0, or the first mismatch and exits 1.
#include <cstdio>
#include <cstdint>
#include <vector>

#include "common/paged.cuh"

template <int kRows, int kStep>
int check(int page_size, int num_pages, const std::vector<int>& ids, int len, int key_begin, int chunk, int j0) {
  constexpr int kTile = 64;
  const int slots = (len + page_size - 1) / page_size;
  int32_t* table = new int32_t[slots > 0 ? slots : 1];  // exactly the slots of len keys
  for (int i = 0; i < slots; ++i) table[i] = ids[i];
  const int n_keys = std::max(0, std::min(key_begin + chunk, len) - key_begin);
  const int64_t kPage = 1000003, kRow = 17;  // any strides: offsets are compared, not dereferenced
  lab::paged::PageCursor<kTile> cursor;
  cursor.start(table, page_size, num_pages, key_begin);
  cursor.fetch(n_keys);
  int bad = 0;
  const int tiles = (n_keys + kTile - 1) / kTile;
  for (int t = 0; t < tiles && !bad; ++t) {
    for (int it = 0; it < kRows; ++it) {
      const int rel = t * kTile + j0 + kStep * it;
      if (rel >= n_keys) continue;  // the loader zero-fills it without asking the cursor's answer
      const int key = key_begin + rel;
      const int page = table[key / page_size];
      const bool want_ok = page >= 0 && page < num_pages;
      int64_t off = -1;  // as decode v03's load_tile: the group's offset, then the row in the group
      const int g = it * kStep / 16;
      const bool ok = cursor.offset(g, kPage, kRow, &off);
      if (ok) off += (j0 + (it * kStep) % 16) * kRow;
      const int64_t want = want_ok ? page * kPage + (key % page_size) * kRow : 0;
      if (ok != want_ok || off != want) {
        std::printf("mismatch: page_size %d len %d begin %d j0 %d tile %d row %d key %d: ok %d/%d off %lld/%lld\n",
                    page_size, len, key_begin, j0, t, it, key, ok, want_ok, (long long)off, (long long)want);
        bad = 1;
        break;
      }
    }
    cursor.advance();
    cursor.fetch(n_keys - (t + 1) * kTile);
  }
  delete[] table;
  return bad;
}

int main() {
  long cases = 0;
  int failed = 0;
  for (int page_size : {16, 32, 48, 64, 80, 128, 256}) {
    for (int len : {0, 1, 15, 16, 17, 63, 64, 65, 200, 1000, 4097}) {
      const int slots = (len + page_size - 1) / page_size;
      const int num_pages = slots + 5;
      std::vector<int> ids(slots);
      for (int i = 0; i < slots; ++i) ids[i] = (i * 7 + 3) % num_pages;  // shuffled
      if (slots > 2) ids[slots / 2] = (len % 2) ? num_pages : -1;        // one bad id inside the length
      for (int chunk : {64, 128, 192, 1024}) {
        for (int split = 0; split * chunk < len + chunk; ++split) {
          for (int j0 = 0; j0 < 16; ++j0) {
            failed |= j0 < 8 ? check<8, 8>(page_size, num_pages, ids, len, split * chunk, chunk, j0) : 0;
            failed |= check<4, 16>(page_size, num_pages, ids, len, split * chunk, chunk, j0);
            cases += 2;
            if (failed) return 1;
          }
        }
      }
    }
  }
  std::printf("ok %ld\n", cases);
  return 0;
}
