// Which form the AVX-512 VNNI kernels take for a product of 1..8 rows of x: one 8-row group of the
// weights a ymm or two a zmm (gguf_vnni.cpp). Both give the same bits; which is faster depends on
// the core and on the machine's state at the time. On the 2-vCPU Zen 5 EPYC (kernels alone, the
// default target's products, 2 threads) the zmm form wins from 4 rows while memory is fast (4 / 5
// / 6 rows 17.9 / 18.4 / 19.5 ms against 21.9 / 25.1 / 28.9 a ymm), but in the VM's slower phases,
// which come and go for minutes, the ymm form wins at 3-4 rows (22.8 / 23.2 ms against 27.0 /
// 26.4). A choice measured once at start is wrong for much of a long run, so each product is
// timed as it runs and takes the form whose recent times are lower, trying the other now and
// then (exact either way: the forms give the same bits).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

namespace gguf {

class FormChooser {
public:
    static constexpr int SLOTS = 512;  // distinct (weight type, shape, rows) products; more: the fixed masks decide
    // form 0 (ymm) or 1 (zmm) for the next product under key, given the fixed masks' form for it
    int pick(uint64_t key, int fixed) {
        std::lock_guard<std::mutex> lock(m_);
        Slot* s = find(key);
        if (!s) return fixed;
        ++s->calls;
        // until both forms have been timed (each one's first time thrown away: first touch of the
        // weights, cold caches), the one seen less, the fixed form first: both after 4 products.
        // The output head runs once a forward per rows, so trying the other form every 8th product
        // left it in the fixed form for the first ~16 forwards of each block size, most of a short
        // generation (Zen 4 EPYC: its 151,936 rows took 7.1-7.5 ms a zmm at 3-5 rows, 5.1-5.5 a ymm)
        if (s->seen[0] < 2 || s->seen[1] < 2)
            return s->seen[1 - fixed] < s->seen[fixed] ? 1 - fixed : fixed;
        const int best = s->ema[1] < s->ema[0], other = 1 - best;
        // try the other form every 16th product while the two are near, every 64th when it is far behind
        const uint32_t period = s->ema[other] < 1.25 * s->ema[best] ? 16 : 64;
        return s->calls % period == 0 ? other : best;
    }
    // a product under key took ns in form f
    void record(uint64_t key, int f, double ns) {
        std::lock_guard<std::mutex> lock(m_);
        Slot* s = find(key);
        if (!s) return;
        if (s->seen[f]++ == 0) return;
        // a running mean over the last ~5 times; a time over twice the mean counts as twice it, so
        // one outlier (a preemption) moves it by 20% at most, a lasting change in a few products
        double& e = s->ema[f];
        e = s->seen[f] == 2 ? ns : e + 0.2 * (std::min(ns, 2.0 * e) - e);
    }
    // [key, times timed in ymm, in zmm, mean ns ymm, mean ns zmm] per product seen
    std::vector<std::array<double, 5>> stats() {
        std::lock_guard<std::mutex> lock(m_);
        std::vector<std::array<double, 5>> out;
        for (const Slot& s : slots_)
            if (s.key) out.push_back({(double)s.key, timed(s, 0), timed(s, 1), s.ema[0], s.ema[1]});
        return out;
    }
    void clear() {
        std::lock_guard<std::mutex> lock(m_);
        slots_ = {};
    }

private:
    struct Slot {
        uint64_t key = 0;  // 0: free
        uint32_t seen[2] = {0, 0}, calls = 0;  // seen: times recorded per form, the first one thrown away
        double ema[2] = {0, 0};
    };
    static double timed(const Slot& s, int f) { return s.seen[f] > 1 ? s.seen[f] - 1 : 0; }  // times in the mean
    Slot* find(uint64_t key) {
        const uint64_t home = (key * 0x9E3779B97F4A7C15ull >> 40) % SLOTS;
        for (uint64_t i = 0; i < SLOTS; ++i) {  // open addressing; keys stay until clear()
            Slot& s = slots_[(home + i) % SLOTS];
            if (s.key == key) return &s;
            if (s.key == 0) {
                s.key = key;
                return &s;
            }
        }
        return nullptr;
    }
    std::array<Slot, SLOTS> slots_{};
    std::mutex m_;
};

// the key of a product: weight kind (4, 6), input and output width, rows of x (1..8); never 0
inline uint64_t form_key(int64_t kind, int64_t in, int64_t out, int64_t rows) {
    return (uint64_t)(kind == 6) | (uint64_t)rows << 1 | (uint64_t)in << 5 | (uint64_t)out << 29;
}

}  // namespace gguf
