package dev.llmsla.flink;

/**
 * Strict UTF-8 validation (Unicode 15, table 3-7), as Python's {@code bytes.decode("utf-8")} does
 * it: no overlong forms, no encoded surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
 *
 * <p>Why: Jackson decodes C1 81 as "A" and ED A0 80 as a lone surrogate without complaint, so a
 * line the contract rejects as "not valid UTF-8" would otherwise be windowed by the job.
 */
final class Utf8 {
    private Utf8() {}

    static boolean isValid(byte[] bytes) {
        int i = 0;
        int n = bytes.length;
        while (i < n) {
            int b = bytes[i] & 0xFF;
            if (b < 0x80) {
                i++;
                continue;
            }
            int need;
            int lo = 0x80;
            int hi = 0xBF;
            if (b >= 0xC2 && b <= 0xDF) {
                need = 1;
            } else if (b >= 0xE0 && b <= 0xEF) {
                need = 2;
                if (b == 0xE0) {
                    lo = 0xA0; // overlong below U+0800
                } else if (b == 0xED) {
                    hi = 0x9F; // U+D800..U+DFFF
                }
            } else if (b >= 0xF0 && b <= 0xF4) {
                need = 3;
                if (b == 0xF0) {
                    lo = 0x90; // overlong below U+10000
                } else if (b == 0xF4) {
                    hi = 0x8F; // above U+10FFFF
                }
            } else {
                return false; // a continuation byte, C0/C1 (overlong) or F5..FF
            }
            if (i + need >= n) {
                return false; // cut short
            }
            int c = bytes[i + 1] & 0xFF;
            if (c < lo || c > hi) {
                return false;
            }
            for (int k = 2; k <= need; k++) {
                c = bytes[i + k] & 0xFF;
                if (c < 0x80 || c > 0xBF) {
                    return false;
                }
            }
            i += need + 1;
        }
        return true;
    }
}
