"""A script that never imports torch."""

total = sum(i * i for i in range(1000))
print(f"sum of squares: {total}")
